"""Verification of candidates against block references: sandboxed execution, numerics, the structured result.

Kept free of imports: the sandbox worker lives in this package and must not pull the rest of the workbench into a
candidate's process.
"""
