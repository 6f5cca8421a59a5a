"""FedNAR's Shakespeare transformer settings of ``transformer_lm`` equal a stack of
``nn.TransformerEncoderLayer`` (post-norm, ReLU, no dropout) with the same weights."""

import math

import torch
from torch import nn

from fedforge.models import build_model

FEDNAR = {"d_model": 32, "heads": 4, "layers": 2, "mlp_ratio": 4, "post_norm": True,
          "activation": "relu", "embed_scale": math.sqrt(32), "causal": False}


def test_matches_torch_encoder_layers():
    torch.manual_seed(0)
    model = build_model("transformer_lm", (20,), 80, **FEDNAR).eval()
    ref = nn.ModuleList(nn.TransformerEncoderLayer(32, 4, 128, dropout=0.0, batch_first=True)
                        for _ in range(2)).eval()
    with torch.no_grad():
        for blk, lay in zip(model.encoder.blocks, ref, strict=True):
            lay.self_attn.in_proj_weight.copy_(blk.attn.qkv.weight)
            lay.self_attn.in_proj_bias.copy_(blk.attn.qkv.bias)
            lay.self_attn.out_proj.weight.copy_(blk.attn.out.weight)
            lay.self_attn.out_proj.bias.copy_(blk.attn.out.bias)
            for a, b in ((lay.linear1, blk.fc1), (lay.linear2, blk.fc2), (lay.norm1, blk.ln1),
                         (lay.norm2, blk.ln2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
    x = torch.randint(0, 80, (3, 20))
    h = model.encoder.tok(x) * math.sqrt(32) + model.encoder.pos.weight[:20]
    for lay in ref:
        h = lay(h)
    want = model.head(h[:, -1])
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


def test_default_is_still_causal_pre_norm():
    torch.manual_seed(0)
    model = build_model("transformer_lm", (12,), 80, d_model=16, layers=1)
    x = torch.randint(0, 80, (2, 12))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 80  # changing the last token cannot change earlier positions
    torch.testing.assert_close(model.forward_all(x)[:, :-1], model.forward_all(y)[:, :-1])
    bidi = build_model("transformer_lm", (12,), 80, d_model=16, layers=1, causal=False)
    assert not torch.allclose(bidi.forward_all(x)[:, 0], bidi.forward_all(y)[:, 0])
