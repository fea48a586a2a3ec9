"""Image classifiers as model factories: inputs are images, not token ids, so each factory returns a
`ModelWithData` whose `batch` makes the examples (spec/model.py).

- `resnet18`: torchvision's ResNet-18 with random weights (`model="ddplab.examples.vision:resnet18"`;
  needs a torchvision built for the installed torch);
- `small_cnn`: a plain two-convolution network, the same contract with nothing to install.
`images(classes, size)` is the data adapter both use: every example a pure function of (seed, id).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..spec.model import ModelWithData

CLASSES, SIZE = 10, 32


def images(classes: int = CLASSES, size: int = SIZE, channels: int = 3):
    """A `batch(sample_ids, seed)` of random images (channels, size, size) and class ids, each example
    drawn from its own generator seeded by (seed, id): any process rebuilds the examples a rank saw."""
    def batch(sample_ids, seed):
        xs, ys = [], []
        for i in sample_ids:
            g = torch.Generator().manual_seed(seed * 1_000_003 + i)
            xs.append(torch.randn(channels, size, size, generator=g))
            ys.append(int(torch.randint(classes, (1,), generator=g)))
        return torch.stack(xs), torch.tensor(ys, dtype=torch.long)
    return batch


def resnet18():
    """torchvision's ResNet-18 for 10 classes, random weights, on 32 x 32 images."""
    try:
        import torchvision
    except ImportError as e:
        raise ImportError(f"this factory needs torchvision built for this torch: pip install torchvision ({e})") from None
    return ModelWithData(torchvision.models.resnet18(num_classes=CLASSES), batch=images())


class SmallCNN(nn.Module):
    def __init__(self, classes: int = CLASSES, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, stride=2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(h.mean(dim=(2, 3)))


def small_cnn(d_model: int = 16):
    """Two convolutions and a linear head (width `d_model`), for 10 classes on 32 x 32 images."""
    return ModelWithData(SmallCNN(width=d_model), batch=images())
