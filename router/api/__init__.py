"""The router's API stage: OpenAI's request and response shapes, tokenization and limits, SSE, errors."""
