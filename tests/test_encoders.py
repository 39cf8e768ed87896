"""Multi-scale encoders for dense tasks: `resnet18` (shapes, torchvision names and size, local checkpoints) and the
`swin` pyramid."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from manytask.errors import ManytaskError
from manytask.models import BACKBONES
from manytask.models.resnet import ResNet18

TINY_SWIN = {"embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4, "image_size": 32,
             "patch_size": 4}


def resnet(input_shape=(3, 32, 32), seed: int = 0, **params) -> ResNet18:
    parsed = BACKBONES.parse_params("resnet18", {"width": 4, **params})
    torch.manual_seed(seed)
    return BACKBONES.get("resnet18").target(input_shape, parsed)


def trained_statistics(model: nn.Module, seed: int) -> nn.Module:
    """One training-mode pass, so the BatchNorm running statistics differ from their initial values."""
    model.train()
    with torch.no_grad():
        model(torch.rand(4, model.in_channels, 32, 32, generator=torch.Generator().manual_seed(seed)))
    return model.eval()


def torchvision_keys() -> set[str]:
    """torchvision resnet18's state-dict keys without fc, written out from its architecture."""
    bn = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    keys = {"conv1.weight", *(f"bn1.{b}" for b in bn)}
    for stage in range(1, 5):
        for block in range(2):
            prefix = f"layer{stage}.{block}."
            keys |= {prefix + "conv1.weight", prefix + "conv2.weight"}
            keys |= {f"{prefix}bn{i}.{b}" for i in (1, 2) for b in bn}
            if stage > 1 and block == 0:
                keys |= {prefix + "downsample.0.weight", *(f"{prefix}downsample.1.{b}" for b in bn)}
    return keys


@pytest.mark.parametrize(("stem", "sizes"), [("small", [32, 16, 8, 4]), ("imagenet", [8, 4, 2, 1])])
def test_resnet18_pyramid_and_feature_shapes(stem, sizes):
    model = resnet(stem=stem).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    maps = model.pyramid(x)
    assert model.pyramid_channels == [4, 8, 16, 32]
    assert [tuple(m.shape) for m in maps] == [(2, c, s, s) for c, s in zip([4, 8, 16, 32], sizes, strict=True)]
    assert model.out_features == 32
    assert torch.allclose(model(x), maps[-1].mean(dim=(2, 3)))  # the vector feature: layer4 average-pooled


def test_resnet18_gray_benchmark_builds_one_channel_conv1():
    model = resnet(input_shape=(32, 32)).eval()
    assert model.conv1.weight.shape == (4, 1, 3, 3)
    assert model(torch.rand(2, 32, 32)).shape == (2, 32)  # (N, H, W) is one channel


def test_resnet18_imagenet_size_matches_torchvision():
    model = resnet(input_shape=(3, 224, 224), width=64, stem="imagenet")
    # torchvision resnet18 has 11,689,512 parameters; fc holds 512·1000 + 1000 = 513,000 of them. Without fc:
    #   stem   conv1 64·3·7·7 = 9,408 + bn1 2·64 = 128                                                  9,536
    #   layer1 2 blocks · (2 convs 64·64·9 = 73,728 + 2 bns 256)                                      147,968
    #   layer2 block0 128·64·9 + 128·128·9 + 512 + downsample 128·64 + 256 = 230,144
    #          block1 2·128·128·9 + 512 = 295,424                                                     525,568
    #   layer3 block0 294,912 + 589,824 + 1,024 + 32,768 + 512 = 919,040; block1 1,180,672          2,099,712
    #   layer4 block0 1,179,648 + 2,359,296 + 2,048 + 131,072 + 1,024 = 3,673,088; block1 4,720,640  8,393,728
    #   total                                                                                      11,176,512
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 11_176_512 == 11_689_512 - 513_000
    assert set(model.state_dict()) == torchvision_keys()


def test_resnet18_without_norm_starts_with_identity_blocks():
    model = resnet(norm="none").eval()
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert model.conv1.bias is not None
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    stem = model.relu(model.conv1(x))
    # each block is relu(0 + x) at init and its input is already non-negative: layer1 passes the stem through
    assert torch.equal(model.pyramid(x)[0], stem)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_resnet18_checkpoint_round_trip_ignores_fc(tmp_path, suffix):
    source = trained_statistics(resnet(seed=1), seed=2)
    state = {key: value.contiguous() for key, value in source.state_dict().items()}
    state |= {"fc.weight": torch.zeros(10, 32), "fc.bias": torch.zeros(10)}  # torchvision's classifier
    path = tmp_path / f"resnet{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    loaded = resnet(seed=3, weights=str(path)).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(resnet(seed=3).eval()(x), source(x))
    assert torch.equal(loaded(x), source(x))
    assert all(torch.equal(a, b) for a, b in zip(loaded.pyramid(x), source.pyramid(x), strict=True))


def test_resnet18_rgb_checkpoint_on_gray_benchmark_repeats_the_channel(tmp_path):
    source = trained_statistics(resnet(seed=1), seed=2)
    path = tmp_path / "rgb.safetensors"
    save_file(source.state_dict(), str(path))
    gray = resnet(input_shape=(1, 32, 32), weights=str(path)).eval()
    assert gray.conv1.weight.shape[1] == 3
    x = torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(5))
    assert torch.equal(gray(x), source(x.expand(-1, 3, -1, -1)))


def test_resnet18_imagenet_normalization():
    plain, normalized = resnet(seed=1).eval(), resnet(seed=1, normalize="imagenet").eval()
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    assert torch.allclose(normalized(x), plain((x - mean) / std))


def test_resnet18_bad_checkpoints_are_one_sentence_errors(tmp_path):
    missing = tmp_path / "nowhere.safetensors"
    with pytest.raises(ManytaskError, match=r"not found: .*nowhere\.safetensors"):
        resnet(weights=str(missing))
    state = resnet().state_dict()
    del state["layer3.1.bn2.running_var"]
    path = tmp_path / "partial.safetensors"
    save_file(state, str(path))
    with pytest.raises(ManytaskError, match=r"partial\.safetensors do not fit .*1 keys missing.*layer3\.1\.bn2"):
        resnet(weights=str(path))
    wider = tmp_path / "wider.safetensors"
    save_file(resnet(width=8).state_dict(), str(wider))
    with pytest.raises(ManytaskError, match=r"wider\.safetensors do not fit .* of another shape"):
        resnet(weights=str(wider))
    rgb = tmp_path / "rgb-only.safetensors"
    save_file(resnet().state_dict(), str(rgb))
    with pytest.raises(ManytaskError, match=r"rgb-only\.safetensors take 3-channel images.* have 2"):
        resnet(input_shape=(2, 32, 32), weights=str(rgb))


def test_resnet18_takes_a_batch_of_one_at_1x1_in_training():
    model = resnet(stem="imagenet").train()  # layer4 of a 32x32 image is 1x1
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 32)


def test_swin_pyramid_shapes_and_link_to_the_pooled_feature():
    pytest.importorskip("transformers")
    params = BACKBONES.parse_params("swin", TINY_SWIN)
    torch.manual_seed(0)
    model = BACKBONES.get("swin").target((1, 20, 20), params).eval()
    x = torch.rand(2, 1, 20, 20, generator=torch.Generator().manual_seed(7))  # resized to image_size 32
    maps = model.pyramid(x)
    assert model.pyramid_channels == [8, 16]
    assert [tuple(m.shape) for m in maps] == [(2, 8, 8, 8), (2, 16, 4, 4)]  # grid 32 / 4 = 8, then merged to 4
    # the pooled feature is the last stage's map, layer-normalized over channels and averaged over positions
    last = model.model.layernorm(maps[-1].flatten(2).transpose(1, 2))
    assert torch.allclose(model(x), last.mean(dim=1), atol=1e-6)
