"""Starts sushy-emulator with the fake driver's random 1-11 s power-change delay set to 0."""
import sys

from sushy_tools.emulator.resources.systems import fakedriver
from sushy_tools.emulator import main

fakedriver.random.randint = lambda a, b: 0
sys.exit(main.main())
