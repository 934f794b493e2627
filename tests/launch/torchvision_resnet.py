#!/usr/bin/env python3
"""dtrain's ResNet checkpoint in torchvision's own model (Debian's
python3-torchvision): the layout is torchvision's when load_state_dict(strict=True)
takes every tensor of model.safetensors, and the logits in evaluation mode
(running statistics) equal dtrain's.

  torchvision_resnet.py CKPT MODEL STEPS INPUTS LOGITS
     CKPT    a checkpoint folder of `dtrain train --model MODEL` (resnet18,
             resnet50, ...; -small: the 3x3 stride-1 stem, no max-pool)
     STEPS   the training steps it took: every BatchNorm's num_batches_tracked
     INPUTS  the images dtrain took (f32, N x C x H x W, C and the classes
             from conv1 and fc)
     LOGITS  dtrain's logits on them (f32, N x classes), within 1e-4
Exits 0 when all holds, 1 with the reason otherwise.
"""
import os
import sys

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_numpy import read_safetensors  # noqa: E402


def main(ckpt, model, steps, inputs, logits_file):
    weights = read_safetensors(ckpt + "/model.safetensors")
    state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
    arch = model.split("-")[0]
    classes, channels = state["fc.weight"].shape[0], state["conv1.weight"].shape[1]
    net = getattr(torchvision.models, arch)(num_classes=classes)
    if model.endswith("-small"):
        net.conv1 = torch.nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
    else:
        net.conv1 = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    net.load_state_dict(state, strict=True)  # raises naming a missing/extra/mis-shaped tensor
    tracked = {k: int(v) for k, v in state.items() if k.endswith("num_batches_tracked")}
    if set(tracked.values()) != {steps}:
        print(f"num_batches_tracked {sorted(set(tracked.values()))}, expected {steps}")
        return 1
    var = state["layer1.0.bn1.running_var"]
    if torch.allclose(var, torch.ones_like(var)):
        print("layer1.0.bn1.running_var is still all ones: the running statistics never moved")
        return 1
    ours = np.fromfile(logits_file, dtype="<f4").reshape(-1, classes)
    x = torch.from_numpy(np.fromfile(inputs, dtype="<f4").reshape(ours.shape[0], channels, 28, 28))
    net.eval()
    with torch.no_grad():
        theirs = net(x).numpy()
    diff = float(np.abs(theirs - ours).max())
    print(f"{model}: {len(state)} tensors loaded strictly, {ours.shape[0]} images, "
          f"logits max |torchvision - dtrain| = {diff:.3g} (largest |logit| "
          f"{float(np.abs(theirs).max()):.3g})")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) != 6:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
