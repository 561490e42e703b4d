#!/usr/bin/env python3
"""load_depth_test.py: load_depth.py on two hand-written SASS batches, one
issued whole and one that waits for each load, in cuobjdump's layout."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

SASS = """
        Function : _Z6kernelv
        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x00000a0000017a02 */
        /*0010*/              @P0  LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0 */
        /*0020*/              @P1  LDG.E.128 R8, desc[UR4][R2.64+0x200] ;   /* 0x0 */
        /*0030*/                   LDG.E.128 R12, desc[UR4][R2.64+0x400] ;   /* 0x0 */
        /*0040*/                   FADD R20, R4, R8 ;   /* 0x0 */
        /*0050*/                   FADD R21, R12, R20 ;   /* 0x0 */
        /*0060*/                   LDG.E.128.STRONG.GPU R28, desc[UR4][R24.64] ;   /* 0x0 */
        /*0070*/              @!P2 IMAD.MOV.U32 R40, RZ, RZ, R28 ;   /* 0x0 */
        /*0080*/                   LDG.E.128 R28, desc[UR4][R24.64+0x200] ;   /* 0x0 */
        /*0090*/                   STG.E.128 desc[UR4][R26.64], R28 ;   /* 0x0 */
        /*00a0*/                   EXIT ;   /* 0x0 */
        Function : _Z5otherv
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0 */
        /*0010*/                   EXIT ;   /* 0x0 */
"""


def main():
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(SASS)
    out = subprocess.run([sys.executable, os.path.join(HERE, "load_depth.py"), f.name,
                          "--kernel", "kernel"], capture_output=True, text=True, check=True)
    os.unlink(f.name)
    lines = out.stdout.splitlines()
    want = ["_Z6kernelv", "  11 instructions, 5 128-bit global loads",
            "  +0x00010:  5 loads, in flight beside each: 2 1 0 0 0"]
    if lines != want:
        print("load_depth_test: expected\n  " + "\n  ".join(want) + "\ngot\n  " +
              "\n  ".join(lines))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
