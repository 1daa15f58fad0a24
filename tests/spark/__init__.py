"""The Spark audit and fan-out."""
