"""The coordinator and the client runner (and fleets of them): the engine and the methods over the bus."""
