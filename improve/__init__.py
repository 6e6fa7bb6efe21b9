"""`teamtr improve`: fine-tune the served team in place, from its traffic to a gated, canaried, atomic
promotion or an automatic rollback (docs/improve.md).

    data.py    served prompts (a window of the server's episodes) and their rewards
    train.py   TeamTR from the versions being served, on those prompts, with resampling
    gate.py    paired bootstrap vs the incumbent on held-out recent prompts + every role's KL to it
    canary.py  canary vs incumbent rewards of live episodes, and the decision
    judge.py   who scores gate and canary: by default not the training reward
    stats.py   the always-valid confidence sequence both decisions rest on
    loop.py    the steps in order, recorded in a state file so a killed run continues or abandons
    watch.py   `--watch`: rounds as traffic arrives, backing off after a setback
    timeline.py  the decisions log as a PNG
"""
