"""CPU screen (session 21): which guesses a draft step shows to the next. The shipped policy
shows the most confident hidden slots; the alternative shows the leftmost hidden ones (the
verifier accepts a prefix). The reveal50 drafter of reveal_screen.py, 2 and 3 forwards, 48
held-out prompts x 64 tokens, against the same AR drafter."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import world as W  # noqa: E402

from turbo_dllm.families.dflash import speculative  # noqa: E402

Shipped = speculative._DFlashProposer


class LeftFirst(Shipped):
    def propose(self, last, length):
        from turbo_dllm.families.dflash.model import DraftContext

        device = self.context.device
        position = length - 1
        block = torch.cat([last, self.masks])[None]
        context = DraftContext(None, torch.arange(position, device=device), None)

        def forward(block):
            hidden = self.drafter.hidden_states(
                block, position + self.offsets, context, projected=self.context
            )
            return hidden[0, 1:]

        shown = torch.zeros(self.drafts, dtype=torch.bool, device=device)
        for count in self.reveals:
            guess = self.drafter.lm_head(forward(block)).argmax(-1)
            picked = (~shown).nonzero().flatten()[:count]
            shown[picked] = True
            block = block.clone()
            block[0, 1 + picked] = guess[picked]
        drafted = self.drafter.greedy_draft(forward(block), last)
        return torch.where(shown, block[0, 1:], drafted)


common = dict(block_size=8, max_new_tokens=64, num_prompts=48, prompt_len=64, strict=False)
drafter, ar = str(W.W / "reveal50-drafter"), str(W.W / "ar2-drafter")
for name, cls in (("confident-first", Shipped), ("left-first", LeftFirst)):
    speculative._DFlashProposer = cls
    *reports, ar_report = speculative.compare(
        str(W.TARGET), [drafter, drafter, ar], str(W.HELD), draft_steps=[2, 3, 1], **common
    )
    for steps, r in zip((2, 3), reports, strict=True):
        ratio = r.tau / ar_report.tau
        se = speculative.tau_ratio_stderr(r, ar_report)
        print(f"{name}, {steps} forwards: tau {r.tau:.2f} +- {r.tau_stderr:.2f}, ratio "
              f"{ratio:.2f} +- {se:.2f}, lossless {r.lossless}", flush=True)  # fmt: skip
