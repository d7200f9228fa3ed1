#!/usr/bin/env python3
"""GPU jobs for the validation ledger (benchmarks/ledger.py --kind gpu), each set by a knobs dict.

    python benchmarks/ledger_gpu_jobs.py --seconds 0 --knobs '{"job": "timm", "num_workers": 2}'

Jobs (knob "job"):
  timm       timm.create_model + timm.optim.create_optimizer_v2 on torchvision FakeData (its
             transforms: decode-sized PIL images, RandomResizedCrop, ToTensor), a plain loop.
  hf         transformers' Trainer on a BERT built from a config, a Dataset that tokenizes its text
             in __getitem__ with a tokenizers WordLevel tokenizer trained here on generated text;
             the DataLoader knobs are TrainingArguments (dataloader_num_workers, _pin_memory,
             _persistent_workers).
  lightning  lightning's Trainer fitting a LightningModule over a DataLoader of a decode-heavy
             Dataset (lightning.pytorch.demos' boring model shape, a larger MLP).
  gan        a DCGAN-style generator/discriminator step on FakeData of `epoch_samples` images.
  tiny       a 16-layer 256-wide MLP on batch 32 (launch-bound); `compile`: torch.compile mode.
  h2d        512x3x224x224 batches copied from host memory each step; `pin_memory` pins them.
  big        data already on the GPU, a large MLP (compute-bound).
DataLoader knobs: num_workers, pin_memory, persistent_workers, prefetch_factor, batch_size,
non_blocking. Loop knobs: item_every (call loss.item() every N steps; 0: never), compile.
Nothing is downloaded: the data is synthetic and every model is built from its config.

Prints `PROGRESS t=UNIX steps=N` every half second (after a torch.cuda.synchronize()).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Progress:
    def __init__(self, seconds: float, every: float = 0.5):
        self.n, self.t_last, self.every = 0, time.time(), every
        self.deadline = time.time() + seconds if seconds > 0 else float("inf")

    def step(self) -> bool:
        self.n += 1
        now = time.time()
        if now - self.t_last >= self.every:
            torch.cuda.synchronize()
            print(f"PROGRESS t={time.time():.3f} steps={self.n}", flush=True)
            self.t_last = now
        return now < self.deadline


def loader_kwargs(k: dict) -> dict:
    kw = {"batch_size": k.get("batch_size", 64), "num_workers": k.get("num_workers", 0),
          "pin_memory": bool(k.get("pin_memory", False)), "shuffle": False}
    if kw["num_workers"] > 0:
        kw["persistent_workers"] = bool(k.get("persistent_workers", False))
        if k.get("prefetch_factor"):
            kw["prefetch_factor"] = k["prefetch_factor"]
    return kw


def epochs(dl):
    while True:
        yield from dl


def maybe_compile(model, k):
    if k.get("compile"):
        return torch.compile(model, mode=k["compile"])
    return model


def train_loop(model, opt, batches, k, prog, loss_fn):
    nb = bool(k.get("non_blocking", False))
    every = int(k.get("item_every", 0) or 0)
    running = torch.zeros((), device="cuda")
    for x, y in batches:
        x, y = x.cuda(non_blocking=nb), y.cuda(non_blocking=nb)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if every == 1:
            loss.item()
        else:
            running += loss.detach()
            if every and prog.n % every == 0:
                running.item()
        if not prog.step():
            return


def job_timm(k, prog):
    import timm
    import torchvision
    from timm.optim import create_optimizer_v2
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.FakeData(size=k.get("epoch_samples", 100000), image_size=(3, 256, 256),
                                       num_classes=1000, transform=tf)
    model = timm.create_model(k.get("model", "resnet50"), num_classes=1000).cuda().to(memory_format=torch.channels_last)
    model = maybe_compile(model, k)
    opt = create_optimizer_v2(model, opt="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4)
    dl = DataLoader(ds, **loader_kwargs(k))
    crit = torch.nn.CrossEntropyLoss()
    train_loop(model, opt, epochs(dl), k, prog, crit)


def job_gan(k, prog):
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)])
    ds = torchvision.datasets.FakeData(size=k.get("epoch_samples", 1000), image_size=(3, 128, 128), transform=tf)
    nz = 100
    g = torch.nn.Sequential(
        torch.nn.ConvTranspose2d(nz, 512, 4, 1, 0, bias=False), torch.nn.BatchNorm2d(512), torch.nn.ReLU(True),
        torch.nn.ConvTranspose2d(512, 256, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(256), torch.nn.ReLU(True),
        torch.nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(128), torch.nn.ReLU(True),
        torch.nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(True),
        torch.nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), torch.nn.Tanh()).cuda()
    d = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 4, 2, 1, bias=False), torch.nn.LeakyReLU(0.2, True),
        torch.nn.Conv2d(64, 128, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(128), torch.nn.LeakyReLU(0.2, True),
        torch.nn.Conv2d(128, 256, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(256), torch.nn.LeakyReLU(0.2, True),
        torch.nn.Conv2d(256, 1, 8, 1, 0, bias=False), torch.nn.Flatten()).cuda()
    og = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = torch.nn.BCEWithLogitsLoss()
    nb = bool(k.get("non_blocking", False))
    every = int(k.get("item_every", 0) or 0)
    for real, _ in epochs(DataLoader(ds, **loader_kwargs(k))):
        real = real.cuda(non_blocking=nb)
        b = real.shape[0]
        z = torch.randn(b, nz, 1, 1, device="cuda")
        fake = g(z)
        od.zero_grad(set_to_none=True)
        ld = bce(d(real), torch.ones(b, 1, device="cuda")) + bce(d(fake.detach()), torch.zeros(b, 1, device="cuda"))
        ld.backward()
        od.step()
        og.zero_grad(set_to_none=True)
        lg = bce(d(fake), torch.ones(b, 1, device="cuda"))
        lg.backward()
        og.step()
        if every == 1:
            lg.item()
        if not prog.step():
            return


def _words(rng, n):
    syll = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "ni", "qu", "ash", "er"]
    return [("".join(rng.choice(syll) for _ in range(rng.randint(1, 3)))) for _ in range(n)]


def job_hf(k, prog):
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast, Trainer, \
        TrainerCallback, TrainingArguments
    rng = random.Random(0)
    vocab_words = _words(rng, 3000)
    texts = [" ".join(rng.choice(vocab_words) for _ in range(rng.randint(200, 400))) for _ in range(2000)]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts[:500], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]")

    class TextDS(Dataset):
        """Tokenizes in __getitem__, with a per-sample Python text clean-up (a typical preprocess)."""

        def __len__(self):
            return 10 ** 6

        def __getitem__(self, i):
            t = texts[i % len(texts)]
            t = " ".join(w.lower().strip(".,;") for w in t.split() if w)
            for _ in range(3):                 # normalisation passes a real pipeline does per sample
                t = " ".join(sorted(t.split(), key=len)[::-1][: 10 ** 6])
            enc = fast(t, truncation=True, max_length=256, padding="max_length")
            return {"input_ids": torch.tensor(enc["input_ids"]), "attention_mask": torch.tensor(enc["attention_mask"]),
                    "labels": torch.tensor(i % 2)}

    cfg = BertConfig(vocab_size=fast.vocab_size + 8, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                     intermediate_size=2048, max_position_embeddings=512, num_labels=2)
    model = BertForSequenceClassification(cfg)

    class Tick(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if not prog.step():
                control.should_training_stop = True
            return control

    nw = int(k.get("num_workers", 0))
    args = TrainingArguments(output_dir="/tmp/ledger-hf", per_device_train_batch_size=k.get("batch_size", 32),
                             max_steps=10 ** 7, logging_strategy="no", save_strategy="no", report_to=[],
                             dataloader_num_workers=nw, dataloader_pin_memory=bool(k.get("pin_memory", True)),
                             dataloader_persistent_workers=bool(k.get("persistent_workers", False)) and nw > 0,
                             dataloader_prefetch_factor=k.get("prefetch_factor") if nw > 0 else None,
                             bf16=True, disable_tqdm=True)
    _ = transformers.__version__
    Trainer(model=model, args=args, train_dataset=TextDS(), callbacks=[Tick()]).train()


class Heavy(Dataset):
    def __init__(self, work, shape):
        self.work, self.shape = work, shape

    def __len__(self):
        return 10 ** 7

    def __getitem__(self, i):
        s = 0.0
        for j in range(self.work):
            s += math.sin(j * i)
        return torch.randn(*self.shape), i % 10


def job_lightning(k, prog):
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 4096), torch.nn.ReLU(),
                                             *[m for _ in range(6) for m in (torch.nn.Linear(4096, 4096),
                                                                              torch.nn.ReLU())],
                                             torch.nn.Linear(4096, 10))

        def training_step(self, batch, _idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            if int(k.get("item_every", 0) or 0) == 1:
                loss.item()
            return loss

        def on_train_batch_end(self, *a):
            if not prog.step():
                self.trainer.should_stop = True

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    dl = DataLoader(Heavy(2000, (3, 64, 64)), **loader_kwargs(k))
    tr = pl.Trainer(accelerator="gpu", devices=1, max_steps=-1, max_epochs=-1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    tr.fit(Net(), dl)


def job_tiny(k, prog):
    x = torch.randn(32, 256, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    layers = []
    for _ in range(16):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = maybe_compile(torch.nn.Sequential(*layers, torch.nn.Linear(256, 10)).cuda(), k)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    train_loop(model, opt, iter(lambda: (x, y), None), k, prog, torch.nn.functional.cross_entropy)


def job_h2d(k, prog):
    xs, ys = torch.randn(512, 3, 224, 224), torch.randint(0, 10, (512,))
    if k.get("pin_memory"):
        xs, ys = xs.pin_memory(), ys.pin_memory()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 224 * 224, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    train_loop(model, opt, iter(lambda: (xs, ys), None), k, prog, torch.nn.functional.cross_entropy)


def job_big(k, prog):
    x = torch.randn(256, 3 * 64 * 64, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    layers = [torch.nn.Linear(3 * 64 * 64, 8192), torch.nn.ReLU()]
    for _ in range(12):
        layers += [torch.nn.Linear(8192, 8192), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(8192, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    train_loop(model, opt, iter(lambda: (x, y), None), k, prog, torch.nn.functional.cross_entropy)


JOBS = {"timm": job_timm, "hf": job_hf, "lightning": job_lightning, "gan": job_gan, "tiny": job_tiny,
        "h2d": job_h2d, "big": job_big}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--knobs", required=True, help="JSON object of knobs")
    a = ap.parse_args()
    k = json.loads(a.knobs)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    JOBS[k["job"]](k, Progress(a.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
