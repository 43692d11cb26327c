"""Datasets and noising policies shared by the tasks (token masking, blockwise masking, pair building)."""
