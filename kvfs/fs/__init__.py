"""The file layer: FUSE operations (translate only), files and directories, the control file,
direct clients' socket (its messages: kvfs/client/wire.py), leases and allocations. May call
write/, tiers/, space/, catalog/ and pool/; nothing calls it."""
