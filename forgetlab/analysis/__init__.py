"""What fine-tuning changed and what it cost: task vectors, linearity, sweeps, features, attribution, merge
search and benchmark measures. Every analysis builds its weights through `forgetlab.merge`'s registry."""
