"""Native-kernel bundles: targets, catalogs and the trust lock, fetch, verify, store, build.

Modules, one concept each: `target` (the typed bundle target), `targets` (the build matrix),
`manifest` (bundle.json), `catalog` (catalog.toml + releases.lock), `resolve` (fingerprint ->
bundle), `fetch` (sources, resumable verified downloads), `archive` (pack, safe extraction),
`store` (install dir, activation, rollback), `install`, `build`, `publish`. Importing this
package loads none of them.
"""

__all__: list[str] = []
