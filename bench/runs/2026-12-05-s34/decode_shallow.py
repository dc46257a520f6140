"""bench/decode.py with the decode kernel's shallow stages only (main before the deep stages): the A/B
arm for session 34's deep-stage variants. Arguments as decode.py's."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from cupyflash._kvcache import device  # noqa: E402

device.DECODE_STAGES.update({d: stages[:1] for d, stages in device.DECODE_STAGES.items()})
import decode  # noqa: E402

sys.exit(decode.main(sys.argv[1:]))
