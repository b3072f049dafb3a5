"""The two trainers and what they share: `NCATrainer` (on TRL's GKDTrainer) and `NCADistillationTrainer` (on TRL's
DistillationTrainer), their configs, the NCA objective, dataset tokenisation, teacher resolution and the rollout
protocol."""
