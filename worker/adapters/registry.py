"""Provider API name → adapter class."""

from __future__ import annotations

from typing import Final

from worker.adapters.anthropic import AnthropicAdapter
from worker.adapters.base import Adapter
from worker.adapters.bedrock_converse import BedrockConverseAdapter
from worker.adapters.gemini import GeminiAdapter
from worker.adapters.gemini_interactions import GeminiInteractionsAdapter
from worker.adapters.openai_chat import OpenAIChatAdapter
from worker.adapters.openai_responses import OpenAIResponsesAdapter

ADAPTERS: Final[dict[str, type[Adapter]]] = {
    "openai_chat": OpenAIChatAdapter,
    "openai_responses": OpenAIResponsesAdapter,
    "anthropic": AnthropicAdapter,
    "gemini": GeminiAdapter,
    "bedrock_converse": BedrockConverseAdapter,
    "gemini_interactions": GeminiInteractionsAdapter,
}
"""Every adapter by the provider name jobs use."""
