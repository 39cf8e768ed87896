"""Many-task methods: clients with different tasks collaborate on what their tasks share (MaTU, SFMTL-Graph,
MaT-FL)."""
