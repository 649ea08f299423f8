#!/usr/bin/perl

# nginx -s reload under traffic loses no request, with the module active in every request.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use POSIX ();
use Time::HiRes qw(time sleep);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_check "s3_${arg_b}_read";
            yarl_account app;
        }
    }
EOF2
$t->run();

# A client in a child process: sequential requests for at most 6 s or 20000 requests.
pipe(my $rd, my $wr) or die "pipe: $!\n";
my $pid = fork() // die "fork: $!\n";
if (!$pid) {
	close $rd;
	my ($n, $bad) = (0, 0);
	my $end = time() + 6;
	while (time() < $end && $n < 20000) {
		$n++;
		$bad++ if status_of(http_get($t->port(8080), "/index.html?b=$n")) != 200;
	}
	print $wr "$n $bad\n";
	close $wr;
	POSIX::_exit(0);
}
close $wr;

sleep 0.5;
for my $i (1 .. 4) {
	ok($t->reload(), "reload $i under traffic");
	sleep 0.5;
}

my $line = <$rd> // '';
waitpid($pid, 0);
my ($n, $bad) = split ' ', $line;
ok($n && $n > 100, "client sent requests during reloads ($n)");
is($bad, 0, 'no request lost or failed');

$t->finish();
done_testing();
