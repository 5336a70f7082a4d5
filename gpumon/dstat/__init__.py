"""`dstat --gpu`: the plugin for Debian's dstat 0.7.4 and dool (plugin/dstat_gpu.py, shipped as
package data and copied where they look), and the install for PCP's pcp-dstat."""
