"""The Responses API (/v1/responses): conversations on top of the chat path."""
