"""Loss-curve replays: a small model of the target architecture trained from scratch and LoRA-fine-tuned with
operators, its loss curve held against the reference run's (see runner.run_replay)."""
