import random, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
import ringmodel as m
N = int(sys.argv[1])
longer = lambda rng: [rng.choice((1, 2, 3, 4, 7)) for _ in range(rng.randrange(1, 10))]
for kStages, kStaged, kUnits in ((2, 4, 1), (2, 6, 1), (2, 8, 1), (1, 3, 1), (1, 4, 2), (1, 5, 2), (2, 8, 2), (2, 9, 2), (1, 2, 1), (2, 1, 2) ):
    m.trials(f"fix kStages={kStages} kStaged={kStaged} kUnits={kUnits}", N, work_fn=longer, kStages=kStages,
             kStaged=kStaged, kUnits=kUnits, fix=True)
