#!/usr/bin/env python3
"""Make the Hugging Face GPT-2 references of tests/hf/ (run by hand, not in CI).

    PYTHON tests/hf/make_ref.py          # PYTHON has torch, transformers, safetensors

Builds a small random GPT2LMHeadModel (2 layers, width 64, 4 heads, vocab
96, 32 positions, dropout off), saves it with Hugging Face's own writer and
names, and records what Hugging Face computes on fixed tokens.  gradc never
takes part: tests/hf/check.py compares gradc against these files.  Output
is deterministic for a given torch version (fixed seed).

Files written next to this script:

    model/config.json, model/model.safetensors
        model.save_pretrained(safe_serialization=True) in float32: the
        names a user's checkpoint has (transformer.h.{l}.attn.c_attn.weight,
        ...; lm_head.weight is tied to transformer.wte.weight and left out
        of the file).  Every tensor is drawn at random, biases and layer-norm
        gains included, so that a mis-mapped or mis-transposed one shows.
    inputs.safetensors
        gradc's inputs for examples/gpt2.gdl: tokens and targets, I32[4, 32].
    ref.safetensors
        logits F32[4, 32, 96], loss F64[] and one gradient per Hugging Face
        parameter under its Hugging Face name (grad.transformer.wte.weight,
        ...; the tied head's share is in grad.transformer.wte.weight, as
        named_parameters() has the one tensor).

The shift.  GPT2LMHeadModel(input_ids, labels=labels) shifts internally: the
logits at position t are scored against labels[t + 1], the last position
against nothing, and the loss is the mean over the scored positions whose
label is not -100.  examples/gpt2.gdl scores position t against targets[t]
with the same mean, so targets = labels shifted left by one with -100 in the
last column; the inputs file holds those targets, and both sides compute the
same objective.

Precision.  The float32 weights are what the file holds; the model is then
run in float64 (model.double(), exact on those values), so the references
measure gradc and not torch's rounding.  Hugging Face computes its own loss
in float32 (ForCausalLMLoss upcasts "to float", which is float32); the
reference loss and the gradients come from the float64 logits through
F.cross_entropy with the same shift and ignore_index, and the script checks
that this agrees with Hugging Face's own loss.  The reference gradients and
logits are stored as F32 (a relative rounding of 6e-8, far below the test's
1e-4) so that the committed files stay under 1 MB; the loss is F64.

Ignored labels: four samples, one micro-batch each at --gas 4, with uneven
numbers of scored positions (31, 21, 24 and 4), so a loss that averaged per
micro-batch instead of over the window would differ.
"""
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.numpy import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, V, C, NH, L = 4, 32, 96, 64, 4, 2
IGNORE = -100


def labels_for(tokens):
    """Hugging Face labels: the tokens, with some positions ignored."""
    labels = tokens.clone()
    labels[1, 22:] = IGNORE                      # padding at the end
    labels[2, torch.tensor([3, 7, 8, 15, 16, 20, 29])] = IGNORE  # scattered
    labels[3, 5:] = IGNORE                       # almost all of it
    return labels


def main():
    torch.manual_seed(20240601)
    cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=NH,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                     bos_token_id=V - 1, eos_token_id=V - 1)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # every tensor random and exact in float32
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias") or ".ln_" in name:
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    assert model.lm_head.weight is model.transformer.wte.weight

    os.makedirs(os.path.join(HERE, "model"), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(HERE, "model", f))

    tokens = torch.randint(0, V, (B, T))
    labels = labels_for(tokens)
    targets = torch.full_like(labels, IGNORE)
    targets[:, :-1] = labels[:, 1:]              # the shift, done here once
    save_file({"tokens": tokens.to(torch.int32).numpy(), "targets": targets.to(torch.int32).numpy()},
              os.path.join(HERE, "inputs.safetensors"))

    model = model.double()
    out = model(input_ids=tokens, labels=labels)
    logits = out.logits                          # [B, T, V], float64
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE)
    hf_loss = out.loss.item()                    # float32 inside Hugging Face
    if abs(hf_loss - loss.item()) > 1e-5 * abs(loss.item()):
        sys.exit("make_ref: Hugging Face's loss %.9g is not the shifted cross-entropy %.9g" % (hf_loss, loss.item()))
    model.zero_grad()
    loss.backward()

    ref = {"logits": logits.detach().float().numpy(), "loss": np.array(loss.item(), dtype=np.float64)}
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad.float().numpy()
    save_file(ref, os.path.join(HERE, "ref.safetensors"), metadata={"hf_loss_f32": repr(hf_loss), "torch": torch.__version__,
                                                                         "transformers": transformers.__version__})

    scored = (targets != IGNORE).sum(dim=1).tolist()
    size = sum(os.path.getsize(os.path.join(HERE, f))
               for f in ("model/config.json", "model/model.safetensors", "inputs.safetensors", "ref.safetensors"))
    print("loss %.9g (Hugging Face, float32: %.9g); scored positions per sample %s; %d parameters; %d bytes"
          % (loss.item(), hf_loss, scored, sum(p.numel() for p in model.parameters()), size))


if __name__ == "__main__":
    main()
