"""The model runner: the one place a forward happens (`ModelRunner.run(decision) -> StepResult`)."""

from llmengine.outcome import StepResult as StepResult
from llmengine.runner.model_runner import ModelRunner as ModelRunner
