"""The tasks this install knows, selected by ``task.name`` in a recipe."""

from __future__ import annotations

from typing import Annotated, Union, get_args

from pydantic import Field

from rollwise.tasks.arith import ArithConfig
from rollwise.tasks.code import CodeConfig
from rollwise.tasks.code_files import HumanEvalConfig, MBPPConfig
from rollwise.tasks.countdown import CountdownConfig
from rollwise.tasks.files import FileTaskConfig
from rollwise.tasks.reasoning_gym import ReasoningGymConfig

_CONFIGS = (ArithConfig, CountdownConfig, FileTaskConfig, CodeConfig, MBPPConfig, HumanEvalConfig,
            ReasoningGymConfig)
TaskConfig = Annotated[Union[_CONFIGS], Field(discriminator="name")]
TASKS = {get_args(c.model_fields["name"].annotation)[0]: c for c in _CONFIGS}  # task.name -> its config
