"""What runs are worth: the Local reference, pooled training, `compare`, `report` and the result table."""
