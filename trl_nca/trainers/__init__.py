"""The two trainers and what they share: `NCATrainer` (GKDTrainer's arguments and behaviour, on TRL's SFTTrainer) and
`NCADistillationTrainer` (on TRL's DistillationTrainer), their configs, the NCA objective and the step loss that runs
it, dataset tokenisation, teacher resolution and the rollout protocol."""
