"""Data files shipped with trl-nca: the quickstart questions and the built-in system prompts."""
