from qstate.cli import main

main()
