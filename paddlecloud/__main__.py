from paddlecloud.cli import main

main()
