"""Native-kernel bundles: targets, catalogs and the trust lock, fetch, verify, store, build.

Modules, one concept each: `target` (the typed bundle target), `targets` (the build matrix),
`manifest` (bundle.json), `catalog` (catalog.toml + releases.lock), `resolve` (fingerprint ->
bundle), `sources` (folders, file:// and HTTP indexes), `fetch` (resumable verified downloads),
`archive` (pack, safe extraction), `store` (install dir, activation, rollback), `install`,
`build`, `publish`. Importing this package loads none of them.

`dllm bundle install` must start and finish in a fraction of a `pip install` (issue 3), so the
modules it imports avoid heavy imports: formats are `turbo_dllm.records` (not pydantic), small
results are NamedTuples (not dataclasses, whose creation runs `exec`), loopback HTTP is a
plain-socket GET (`loopback_http`, not requests or http.client), the lock is `fcntl.flock`
(not filelock).
"""

__all__: list[str] = []
