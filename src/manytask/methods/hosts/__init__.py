"""Host optimizers: one global model, clients train what they were sent; every plug-in wraps any of them."""
