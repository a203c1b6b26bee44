"""The router's admission stage: API keys, the in-flight limit, and request plugins."""
