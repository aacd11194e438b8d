"""Train DiCoSA on one benchmark: ``dicosa train`` for a checkout (see ``train.py --help``).

    python train.py --dataset msrvtt
    accelerate launch --multi_gpu --num_processes 4 train.py --dataset msrvtt train.lr=5e-5
"""

from dicosa.cli.train_cmd import main

if __name__ == "__main__":
    main()
