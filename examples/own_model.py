"""A model of your own, trained by cosparse: ``python examples/own_model.py CRITEO_TSV``.

The model is plain torch holding one ``cosparse.EmbeddingBagCollection``; the engine places its
rows (here a device tier of 20,000 rows over the host, as the config says) and trains it.
"""

import sys

import torch
from torch import nn

import cosparse

TABLES = [{"name": "ids", "dim": 16, "features": [f"C{i}" for i in range(1, 27)]}]


class MyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = cosparse.EmbeddingBagCollection(TABLES)
        self.dense = nn.LazyLinear(16)  # materialised on the first batch
        self.top = nn.Sequential(nn.LazyLinear(64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, batch: cosparse.Batch) -> torch.Tensor:
        pooled = self.embeddings(batch)  # {feature: Tensor[B, 16]}, in the tables' order
        x = torch.cat([*pooled.values(), torch.relu(self.dense(batch.dense))], dim=1)
        return self.top(x).squeeze(1)  # one logit per sample


config = {"data": {"reader": "criteo_tsv", "path": sys.argv[1], "batch_size": 256},
          "store": {"device": {"rows": 20000}},  # a bounded device tier over the host tier
          "train": {"epochs": 1, "progress": False}}

if __name__ == "__main__":
    with cosparse.Trainer(MyModel(), config) as trainer:
        result = trainer.fit()
    print(f"auc {result.metrics['auc.label']:.4f}, {result.metrics['samples_per_s']:,.0f} samples/s")
