from lmcalc.cli import main

main()
