"""A private tmux server for tests that look at a command as a person sees it."""

from __future__ import annotations

import os
import subprocess

from tests.faults import wait_for


class Tmux:
    """A private tmux server (its own socket), killed at the end; nothing else is touched.
    ``window`` is the name of the window the test runs its command in."""

    def __init__(self, window: str) -> None:
        self.window = window
        self.socket = f"mqttfl-{window}-test-{os.getpid()}"

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=20
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.window)

    def wait_screen(self, *needles: str, timeout: float) -> str:
        def showing() -> str | None:
            screen = self.screen()
            return screen if all(needle in screen for needle in needles) else None

        return str(wait_for(showing, timeout=timeout, what=f"{needles} on the screen"))

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)
