"""The dstat/dool plugin, shipped as package data: `gpumon dstat-plugin install` copies it."""
