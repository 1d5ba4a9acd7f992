"""The tasks this install knows, selected by ``task.name`` in a recipe."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from rollwise.tasks.arith import ArithConfig
from rollwise.tasks.countdown import CountdownConfig
from rollwise.tasks.files import FileTaskConfig

TaskConfig = Annotated[Union[ArithConfig, CountdownConfig, FileTaskConfig], Field(discriminator="name")]
TASKS = {"arith": ArithConfig, "countdown": CountdownConfig, "file": FileTaskConfig}
