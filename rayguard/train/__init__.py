"""What a training function calls inside a worker (being written)."""
