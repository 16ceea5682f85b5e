"""The serving engine over the mirror: the depth-D pipeline, continuous batching, decoder models.

It uses the mirror (`ttmirror.impl`) through its public interface only: a `Backend`, the
`Runner`'s phases and the backend's `Mirror`. Nothing in `ttmirror.impl` imports this package,
so the safety-critical path can be read without it; and it imports nothing of the emulated
device (`ttmirror.emulator`), whose decoder op it finds through `decoders.py`.

    engine.py          Engine: the runner's phases composed into the depth-D pipeline
    batching.py        ServingEngine: prompts, a KV budget that preempts, device-resident context
    backend.py         ServingBackend: the backend's mirror, with a decoder in place of the probe
    context.py         per-row context of a step, sampling parameters, the decoder step's numerics
    decoders.py        where the decoder op on a TT device comes from (entry points, by kind)
    models.py          decoder models: the probe decoder, tiny transformers, cached checkpoints
    catalog.py         model names (no torch import: the CLI lists them cheaply)
    grammar.py         allowed-token constraints the host builds from a request's tokens
    workload.py        request plans and the loop that serves them
"""
