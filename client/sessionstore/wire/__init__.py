# The wire layer, shared by the clients and the daemon, sans-IO: framing and
# decoding of CBOR items and JSON lines, the envelope, the error codes, the
# canonical encoding and its digest, and the compiled CBOR byte helper with
# its Python twin.
