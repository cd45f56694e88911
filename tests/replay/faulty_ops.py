"""Operator files that crash or hang, for the replay's error-path tests (the defective-but-running ones are
workbench.replay.faults)."""

from __future__ import annotations

from workbench.replay.faults import HEADER

CRASHING = HEADER + '''

def run(*args):
    raise RuntimeError("illegal memory access (simulated)")
'''

HANGING = HEADER + '''
import time


def run(*args):
    time.sleep(3600)
'''
