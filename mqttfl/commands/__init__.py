"""The command line: one module per command, assembled by :mod:`mqttfl.commands.main`."""
