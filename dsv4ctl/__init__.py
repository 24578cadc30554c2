"""dsv4ctl: ops toolkit for DeepSeek-V4 on SGLang 0.5.18-0.5.23."""

__version__ = "0.1.0"
