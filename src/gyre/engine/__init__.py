"""Inference engines: the SGLang-speaking client, the embedded CPU/GPU engine and the SGLang launcher."""
