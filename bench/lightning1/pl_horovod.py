"""Seed 003's Pytorch_lightning_* rows: Lightning 1.9.5's strategy="horovod"
against .venv-torch's torch and Horovod, under horovodrun -np 2
(bench/lightning1/try.sh)."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
trainer = pl.Trainer(
    strategy="horovod",
    accelerator="cpu",
    max_steps=3,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
)
trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=8))
print(
    "pytorch_lightning",
    pl.__version__,
    "torch",
    torch.__version__,
    "ran",
    trainer.global_step,
    "steps on rank",
    trainer.global_rank,
)
