"""What every API request passes before any work: it names the served model, and it asks for nothing kvferry
does not implement (refused by name, as OpenAI refuses a parameter it does not know, or with
`unsupported_fields: warn` logged, as vLLM does; never dropped unseen)."""

from __future__ import annotations

import logging

from pydantic import BaseModel

from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import unsupported_fields
from kvferry.router.config import UnsupportedFields

log = logging.getLogger(__name__)


class RequestCheck:
    def __init__(self, model: str, unsupported: UnsupportedFields) -> None:
        self.model, self.unsupported = model, unsupported

    def __call__(self, body: BaseModel) -> None:
        """Raises APIError: 404 for another model, 400 naming the first unsupported field."""
        requested = getattr(body, "model", self.model)
        if requested != self.model:
            raise APIError(404, f"The model `{requested}` does not exist; this router serves `{self.model}`",
                           param="model", code="model_not_found")
        found = unsupported_fields(body)
        if not found:
            return
        if self.unsupported == "warn":
            log.warning("ignored what kvferry does not support in a request: %s", ", ".join(found))
            return
        raise APIError(400, f"Unsupported parameter(s): {', '.join(found)}: kvferry does not implement "
                       f"{'them' if len(found) > 1 else 'it'}", param=found[0], code="unsupported_parameter")
