"""The porting agent: a LangGraph workflow that renders candidates from templates, compiles, verifies, diagnoses,
revises and promotes. Proposers choose the points; repair rules name why."""
