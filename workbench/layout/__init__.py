"""The layout planner (`workbench layout`): per-card memory and communication of a training layout, modelled from a
model card (workbench.layout.model) by workbench.layout.plan."""

from workbench.layout.model import from_card, from_replay
from workbench.layout.plan import HBM_GB, Model, Plan, compare_experts, plan_layout

__all__ = ["HBM_GB", "Model", "Plan", "compare_experts", "from_card", "from_replay", "plan_layout"]
