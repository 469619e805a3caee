"""What `kvfs doctor` reports: one finding per check. Its own module, so that the doctor and
its client checks (doctor_clients.py) both import it and neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Finding:
    status: str  # ok, info, warn, fail
    check: str
    detail: str
    fix: str = ""
