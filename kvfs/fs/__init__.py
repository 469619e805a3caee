"""The file layer: FUSE operations (translate only), files and directories, the control file,
direct clients' leases. May call write/, tiers/, space/, catalog/ and pool/; nothing calls it."""
