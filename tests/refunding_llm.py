# An ADK model of our own in place of a network one, for the effects tests: it asks
# for the refund of order 1001, then answers with what the tool said.
from __future__ import annotations

from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types


class RefundingLlm(BaseLlm):
    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = (llm_request.contents[-1].parts or [types.Part()])[0]
        if last.function_response is not None:
            part = types.Part(text=f"done: {last.function_response.response}")
        else:
            call = types.FunctionCall(name="refund_order", args={"order": "1001"})
            part = types.Part(function_call=call)
        yield LlmResponse(content=types.Content(role="model", parts=[part]))
