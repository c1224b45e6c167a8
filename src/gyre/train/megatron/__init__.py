"""The Megatron-core training backend (``trainer.backend = "megatron"``): weight conversion, the model and its
log-probabilities, and tensor-parallel members. Imports megatron-core only when used."""
