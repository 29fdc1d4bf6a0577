"""test/gpu/racecheck_triage.py on synthetic SASS: the warp_specialize hand-off (state bytes and
captures written before a whole-CTA `bar.sync 1`, read after it) is recognised, and a report on
any other shared memory (a tile written by the default partition between other barriers, an
`LDSM`) is not."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "gpu"))
import racecheck_triage as triage  # noqa: E402

SASS = """
        /*00f0*/                   BAR.SYNC.DEFER_BLOCKING 0x1 ;
        /*0110*/                   LDS.U8 R0, [R0+UR28+0xc17c] ;
        /*0340*/                   LDS R0, [UR8+0xc010] ;
        /*0400*/                   LDSM.16.M88.4 R4, [R2+0x400] ;
        /*0410*/                   LDS.128 R8, [UR8+0x2000] ;
        /*5000*/                   STS.128 [UR8+0x2000], R4 ;
        /*5010*/                   BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;
        /*57b0*/                   STS.64 [UR8+0xc180], R8 ;
        /*57d0*/                   STS.64 [UR8+0xc010], R2 ;
        /*57e0*/                   BAR.SYNC.DEFER_BLOCKING 0x1 ;
        /*6000*/                   STS [UR8+0x400], R1 ;
        /*6010*/                   BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;
"""

LOG = """========= Error: Race reported between Read access at attn_fwd_gluon+0x110
=========     and Write access at attn_fwd_gluon+0x57b0 [9 hazards]
=========
========= Error: Race reported between Write access at attn_fwd_gluon+0x57d0
=========     and Read access at attn_fwd_gluon+0x340 [4 hazards]
=========     and Read access at attn_fwd_gluon+0x410 [1 hazards]
=========
========= Error: Race reported between Read access at attn_fwd_gluon+0x400
=========     and Write access at attn_fwd_gluon+0x6000 [2 hazards]
"""


class TriageTest(unittest.TestCase):
    def setUp(self):
        instrs = triage.parse_sass(SASS)
        self.variants = {"attn_fwd_gluon": [("v.cubin", dict(instrs), triage.handoff_writes(instrs))]}

    def test_handoff_writes_are_the_stores_right_before_bar_sync_1(self):
        instrs = triage.parse_sass(SASS)
        self.assertEqual(triage.handoff_writes(instrs), [(0xc180, 0xc188), (0xc010, 0xc018)])

    def test_pairs_are_read_from_the_log(self):
        self.assertEqual(triage.reported_pairs(LOG), [
            ("attn_fwd_gluon", 0x110, 0x57b0), ("attn_fwd_gluon", 0x400, 0x6000),
            ("attn_fwd_gluon", 0x57d0, 0x340), ("attn_fwd_gluon", 0x57d0, 0x410)])

    def test_only_handoff_pairs_are_explained(self):
        rows = {(a, b): proof for _, a, b, proof, _, _ in triage.triage(triage.reported_pairs(LOG), self.variants)}
        self.assertEqual(rows[(0x110, 0x57b0)], "v.cubin")  # state byte, register-indexed read
        self.assertEqual(rows[(0x57d0, 0x340)], "v.cubin")  # captured argument
        self.assertIsNone(rows[(0x57d0, 0x410)])  # a tile the default partition wrote elsewhere
        self.assertIsNone(rows[(0x400, 0x6000)])  # LDSM is not a plain LDS; 0x400 is no hand-off

    def test_an_unknown_kernel_is_not_explained(self):
        rows = triage.triage([("other_kernel", 0x110, 0x57b0)], self.variants)
        self.assertIsNone(rows[0][3])


if __name__ == "__main__":
    unittest.main()
